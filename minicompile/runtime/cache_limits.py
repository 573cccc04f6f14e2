"""Bounds on the on-disk cache, and what ``minicompile.cache_info()`` / ``clear_cache()``
report and do.

Least recently used first: at most ``cache_max_entries`` warm entries per function, and
``cache_max_bytes`` over the whole directory (checked every ``CHECK_EVERY`` stored entries:
a walk costs tens of milliseconds).  *Used* is a file's access time, set when it is loaded or
found, or its modification time if later.  Files go by *group* (the files of one key in one
folder), so no half of a build is left behind.  Concurrent processes: a file that vanishes
is no error, and one being written (``.name.*.tmp``) is left alone until it is an hour old.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

from minicompile import config, trace
from minicompile.config import Config
from minicompile.runtime import build, cache

CHECK_EVERY = 16  # entries stored between two checks of the total size, per process
STALE_TEMPORARY = 3600.0  # seconds after which a half-written file is a dead process's
_stored = 0  # entries this process stored (for CHECK_EVERY)


def make_room(folder: Path, keep: int, name: str) -> None:
    """Before a new entry is written into ``folder`` (one function's entries): evict the
    least recently used until fewer than ``keep`` are left."""
    found = [(t, p) for p in folder.glob("*.json") if (t := cache.last_used(p)) is not None]
    found.sort()
    for _, path in found[: max(0, len(found) - keep + 1)]:
        _remove(path)
        trace.emit("cache", name, f"evicted {path.name}: more than {keep} entries of this "
                   f"function (the least recently used goes)")


def entry_stored(cfg: Config) -> None:
    """Count an entry stored; every ``CHECK_EVERY`` (the first included), bound the whole
    cache's size."""
    global _stored
    _stored += 1
    if (_stored - 1) % CHECK_EVERY == 0:
        bound(cfg.cache_dir, cfg.cache_max_bytes)


class _Group:
    """The files of one key in one folder."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.size = 0
        self.used = 0.0


def _groups(cache_dir: Path) -> list[_Group]:
    """Every group under ``cache_dir/<kind>/<folder>/`` (the layout of cache.store)."""
    groups: dict[tuple[Path, str], _Group] = {}
    now = time.time()
    for kind in _entries(cache_dir):
        for folder in _entries(kind):
            for path in _entries(folder):
                size, used = _measure(path)
                if used is None:
                    continue  # gone meanwhile
                if path.name.startswith(".") and now - used < STALE_TEMPORARY:
                    continue  # being written
                key = (folder, path.name if path.name.startswith(".") else
                       path.name.split(".")[0])
                group = groups.setdefault(key, _Group())
                group.paths.append(path)
                group.size += size
                group.used = max(group.used, used)
    return list(groups.values())


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []


def _measure(path: Path) -> tuple[int, float | None]:
    """Bytes of ``path`` (a file, or a folder's files) and when it was last used (None:
    gone meanwhile)."""
    try:
        st = path.stat()
    except OSError:
        return 0, None
    used = max(st.st_atime, st.st_mtime)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, used
    size = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                size += os.stat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return size, used


def bound(cache_dir: Path, max_bytes: int) -> int:
    """Evict the least recently used groups until the cache holds at most ``max_bytes``;
    returns the bytes freed."""
    groups = _groups(cache_dir)
    total = sum(g.size for g in groups)
    freed = 0
    for group in sorted(groups, key=lambda g: g.used):
        if total - freed <= max_bytes:
            break
        for path in group.paths:
            _remove(path)
        freed += group.size
    if freed:
        trace.emit("cache", "cache", f"evicted {freed} bytes: the cache directory held "
                   f"{total} bytes, over its bound of {max_bytes}")
    return freed


def _remove(path: Path) -> None:
    """Remove a file or folder that another process may be removing too."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def cache_info() -> dict:
    """The on-disk cache: its ``directory``, the warm ``entries`` in it and the
    ``functions`` they are of, the ``bytes`` it holds, and its bounds
    (``max_entries_per_function``, ``max_bytes``)."""
    cfg = config.get()
    entries = [len(list(folder.glob("*.json"))) for folder in _entries(cfg.cache_dir / "entries")]
    return {"directory": str(cfg.cache_dir), "entries": sum(entries),
            "functions": sum(1 for n in entries if n),
            "bytes": sum(g.size for g in _groups(cfg.cache_dir)),
            "max_entries_per_function": cfg.cache_max_entries,
            "max_bytes": cfg.cache_max_bytes}


def clear_cache() -> None:
    """Remove everything in the cache directory.  Compiled code in memory stays usable (a
    loaded library or module does not need its file); what is compiled next is built and
    stored anew."""
    for path in _entries(config.get().cache_dir):
        _remove(path)
    build.forget()
