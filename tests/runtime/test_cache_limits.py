"""The on-disk cache stays bounded (minicompile/runtime/cache_limits.py): at most
``cache_max_entries`` warm entries per function and ``cache_max_bytes`` over the directory,
the least recently used evicted first, safe with other processes evicting at the same time;
``minicompile.cache_info()`` and ``clear_cache()``.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.runtime import cache, cache_limits


def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + torch.cos(y)


def call(compiled, rows: int) -> None:
    x, y = torch.randn(rows, 8), torch.randn(rows, 8)
    torch.testing.assert_close(compiled(x, y), fn(x, y))


def entry_files(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("entries/*/*.json"))


def write(path: Path, size: int, used: float) -> Path:
    """A cache file of ``size`` bytes, last used ``used`` seconds ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    when = time.time() - used
    os.utime(path, (when, when))
    return path


def test_a_function_keeps_its_most_recently_used_entries(tmp_path: Path) -> None:
    with config.patch(warm_entries=True, cache_dir=tmp_path, cache_max_entries=2):
        compiled = minicompile.compile(fn, backend="cpp", dynamic=False)
        for rows in (2, 3):
            call(compiled, rows)
        two, three = (p.name for p in sorted(entry_files(tmp_path), key=os.path.getmtime))
        minicompile.reset()  # a new process: uses the entry for 2 rows, then compiles 4
        for rows in (2, 4):
            call(compiled, rows)
        assert minicompile.stats()["warm_entries"] == 1
        names = {p.name for p in entry_files(tmp_path)}
        assert len(names) == 2 and two in names and three not in names, names
        info = minicompile.cache_info()
    assert (info["entries"], info["functions"], info["max_entries_per_function"]) == (2, 1, 2)
    assert info["directory"] == str(tmp_path) and info["bytes"] > 0, info


def test_the_directory_is_bounded_by_whole_groups_least_recently_used_first(
    tmp_path: Path,
) -> None:
    old = [write(tmp_path / "cpp" / "ab" / f"ab01.{ext}", 400, used=300)
           for ext in ("cpp", "so", "sum")]
    recent = write(tmp_path / "cpp" / "cd" / "cd02.so", 400, used=10)
    entry = write(tmp_path / "entries" / "f1" / "e1.json", 400, used=100)
    writing = write(tmp_path / "py" / "ef" / ".mc_ef03.py.x1.tmp", 5000, used=0)
    dead = write(tmp_path / "py" / "ef" / ".mc_ef04.py.x2.tmp", 100, used=7200)
    freed = cache_limits.bound(tmp_path, max_bytes=1000)
    # The oldest group goes whole (1200 bytes); the stale temporary (100) too; a file being
    # written is neither counted nor touched.
    assert freed == 1300 and not any(p.exists() for p in [*old, dead])
    assert recent.exists() and entry.exists() and writing.exists()
    assert cache_limits.bound(tmp_path, max_bytes=1000) == 0


def test_eviction_tolerates_files_vanishing_under_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    files = [write(tmp_path / "entries" / "f1" / f"e{k}.json", 100, used=100 - k)
             for k in range(4)]
    last_used = cache.last_used

    def racing(path: Path) -> float | None:  # another process evicts each file first
        path.unlink(missing_ok=True)
        return last_used(path)

    monkeypatch.setattr(cache, "last_used", racing)
    cache_limits.make_room(tmp_path / "entries" / "f1", keep=2, name="f")
    assert cache_limits.bound(tmp_path, max_bytes=0) == 0
    monkeypatch.undo()
    assert not any(p.exists() for p in files)
    cache_limits._remove(files[0])  # gone already: no error
    assert cache.mark_used(files[0]) is False and cache.find(tmp_path, ("x",), "y") is None


def test_two_writers_evicting_at_once(tmp_path: Path) -> None:
    """Two writers (threads: the same races on the files as two processes, without two
    more starts of PyTorch) store, make room and bound the size in one directory."""
    counts, errors = {}, []

    def writer(me: str) -> None:
        deadline, k = time.time() + 1.0, 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # (a cache refused would warn)
                while time.time() < deadline:
                    cache_limits.make_room(tmp_path / "entries" / "f", keep=4, name="f")
                    cache.store(tmp_path, ("entries", "f"), f"{me}{k}.json", b"x" * 1000)
                    cache.store(tmp_path, ("cpp", me), f"{me}{k}.so", b"y" * 1000)
                    cache_limits.bound(tmp_path, max_bytes=20_000)
                    k += 1
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
        counts[me] = k

    threads = [threading.Thread(target=writer, args=(me,)) for me in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and min(counts.values()) > 10, (errors, counts)
    # Each writer may add one beyond the bound between its check and its write.
    assert len(list((tmp_path / "entries" / "f").glob("*.json"))) <= 4 + 1
    total = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert total <= 20_000 + 2 * 2000


def test_clear_cache_empties_the_directory(tmp_path: Path) -> None:
    with config.patch(warm_entries=True, cache_dir=tmp_path):
        compiled = minicompile.compile(fn, backend="cpp")
        call(compiled, 4)
        assert minicompile.cache_info()["entries"] == 1
        minicompile.clear_cache()
        info = minicompile.cache_info()
        assert (info["entries"], info["functions"], info["bytes"]) == (0, 0, 0), info
        call(compiled, 4)  # what is in memory still runs
        minicompile.reset()  # a new process: nothing on disk, so it compiles and stores
        call(compiled, 4)
        assert minicompile.stats()["frames"] == 1 and minicompile.cache_info()["entries"] == 1


def test_the_bounds_are_read_from_the_environment() -> None:
    cfg = config.from_env({"MINICOMPILE_CACHE_MAX_ENTRIES": "4",
                           "MINICOMPILE_CACHE_MAX_BYTES": "512M"})
    assert (cfg.cache_max_entries, cfg.cache_max_bytes) == (4, 512 << 20)
    assert config.from_env({}).cache_max_bytes == 2 << 30
    for bad in ("lots", "0", "-1G"):
        with pytest.raises(ValueError, match="MINICOMPILE_CACHE_MAX_BYTES"):
            config.from_env({"MINICOMPILE_CACHE_MAX_BYTES": bad})
