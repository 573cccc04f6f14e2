"""The on-disk cache: generated code, built libraries and warm entries, keyed by a hash of
their source and the tool versions, written atomically, verified (sha256) when read back.
Never a reason to fail: a cache directory that cannot be used gives one warning, and the
process goes on with a private temporary directory.  Directories are private (0700).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

_fallback: dict[Path, Path] = {}  # configured directory -> this process's private one
_warned: set[str] = set()
_made: set[Path] = set()  # cache directories this process has used


class CacheCorrupted(Exception):
    """A file read back from the cache does not match its checksum (truncated, edited)."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        super().__init__(f"{path}: {detail}")


def warn_corrupted(path: Path) -> None:
    """The one warning for a bad cache file (whoever meets it first)."""
    warn_once(f"cache file {path} is corrupted (truncated or modified): compiling it again")


def warn_once(message: str) -> None:
    """One warning per distinct cache problem, however often it is met."""
    if message in _warned:
        return
    _warned.add(message)
    warnings.warn(f"minicompile: {message}", RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=None)
def tool_versions(cxx: str) -> str:
    """Everything that changes what a source file builds to, found without importing
    Triton or running the compiler (the compiler is named by its path, size and mtime: a
    new compiler is another key)."""
    parts = [f"python={sys.version}", f"torch={torch.__version__}:{torch.__file__}",
             f"machine={platform.machine()}"]
    parts.append(f"triton={_triton_version()}")
    found = shutil.which(cxx)
    try:
        st = os.stat(found) if found else None
        parts.append(f"cxx={found}:{st.st_size}:{st.st_mtime_ns}" if st else f"cxx={cxx}:missing")
    except OSError:
        parts.append(f"cxx={cxx}:missing")
    return "\n".join(parts)


def _triton_version() -> str:
    """Triton, found without importing it (a tenth of a second) or reading package
    metadata (scanning sys.path): where its package is, and a hash of its ``__init__.py``,
    which holds ``__version__``."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return "none"
    try:
        return f"{spec.origin}:{sha256_bytes(Path(spec.origin).read_bytes())[:16]}"
    except OSError:
        return f"{spec.origin}:unreadable"


def cache_key(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    """The file's sha256, or None when it cannot be read."""
    try:
        return sha256_bytes(path.read_bytes())
    except OSError:
        return None


def _make_private(path: Path) -> None:
    """Create ``path`` (and missing parents, each) readable by the user only."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            if not p.is_dir():  # a file where the directory should be
                raise NotADirectoryError(f"{p} is not a directory") from None


def _private_fallback(configured: Path, why: str) -> Path:
    if configured not in _fallback:
        _fallback[configured] = Path(tempfile.mkdtemp(prefix="minicompile-"))
        atexit.register(shutil.rmtree, _fallback[configured], ignore_errors=True)
        warn_once(f"the cache directory {configured} cannot be used ({why}); compiling into "
                  f"a private temporary directory for this process ({_fallback[configured]})")
    return _fallback[configured]


def folder(cache_dir: Path, *parts: str) -> Path:
    """The directory ``cache_dir/parts``, created (0700); when that fails, the same place
    under this process's private temporary directory (one warning).  A cache directory
    deleted while the process runs is made again (one warning)."""
    base = _fallback.get(cache_dir, cache_dir)
    path = base.joinpath(*parts)
    if base in _made and not base.is_dir():
        warn_once(f"the cache directory {base} was deleted while running: made again (what "
                  f"was built before is built again)")
    try:
        _make_private(base)
        _make_private(path)
        _made.add(base)
        return path
    except OSError as e:
        if base != cache_dir:
            raise  # the private directory itself is gone: nothing left to try
        path = _private_fallback(cache_dir, _reason(e)).joinpath(*parts)
        _make_private(path)
        return path


def _reason(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    _make_private(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store(cache_dir: Path, parts: tuple[str, ...], name: str, data: str | bytes) -> Path:
    """Write ``data`` as ``cache_dir/parts/name`` (atomically); when the cache directory
    cannot take it (read-only, full, deleted), write it to the private directory instead.
    Returns where it was written."""
    path = folder(cache_dir, *parts) / name
    try:
        write_atomic(path, data)
        return path
    except OSError as e:
        if path.is_relative_to(_fallback.get(cache_dir, Path("/nonexistent-fallback"))):
            raise
        path = _private_fallback(cache_dir, _reason(e)).joinpath(*parts, name)
        write_atomic(path, data)
        return path


def scratch(cache_dir: Path, parts: tuple[str, ...], name: str, suffix: str) -> Path:
    """A new empty file beside where ``name`` will go (for a compiler to write into, then
    :func:`os.replace`), in the private directory when the cache refuses it."""
    path = folder(cache_dir, *parts)
    try:
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{name}.", suffix=suffix)
    except OSError as e:
        path = _private_fallback(cache_dir, _reason(e)).joinpath(*parts)
        _make_private(path)
        fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{name}.", suffix=suffix)
    os.close(fd)
    return Path(tmp)


def places(cache_dir: Path) -> list[Path]:
    """Where files of ``cache_dir`` may be: there, and in this process's private directory
    once the cache refused something."""
    return [cache_dir] + ([_fallback[cache_dir]] if cache_dir in _fallback else [])


def find(cache_dir: Path, parts: tuple[str, ...], name: str) -> Path | None:
    """``cache_dir/parts/name`` if it exists there (or in this process's private
    directory), marked used (:func:`mark_used`), else None.  Never creates anything."""
    for base in places(cache_dir):
        path = base.joinpath(*parts, name)
        try:
            found = path.is_file()
        except OSError:
            continue
        if found and mark_used(path):
            return path
    return None


def mark_used(path: Path) -> bool:
    """Mark ``path`` used now, for least-recently-used eviction (runtime/cache_limits.py):
    its access time, so that its modification time still says when it was written.
    False when it is gone (evicted by another process meanwhile)."""
    try:
        st = path.stat()
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except FileNotFoundError:
        return False
    except OSError:  # a cache we may read but not write is still a cache
        pass
    return True


def last_used(path: Path) -> float | None:
    """When ``path`` was last used (:func:`mark_used`) or written; None when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return max(st.st_atime, st.st_mtime)


def read_verified(path: Path, sha256: str) -> bytes:
    """The bytes of ``path``, raising CacheCorrupted unless their sha256 is ``sha256``."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CacheCorrupted(path, f"cannot be read ({_reason(e)})") from e
    if sha256_bytes(data) != sha256:
        raise CacheCorrupted(path, "does not match its checksum")
    return data


def discard(path: Path) -> None:
    """Remove a bad cache file, if we may (another process may have replaced it already)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
