"""The cache directory misbehaving (minicompile/runtime/cache.py): a file where the directory
should be, a read-only directory, a full disk, a directory deleted while running, two
processes writing at once.  Each gives at most one warning, and every call still returns
eager's values (compiled in a private directory when the cache refuses).  Directories are
created private to the user (0700).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import minicompile
from minicompile import config
from minicompile.runtime import cache

from test_warm_entries import ROOT, SCRIPT, run_script


def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + torch.cos(y)


def other(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) - y


@pytest.fixture(autouse=True)
def _fresh_cache_state():
    """Each test meets its cache problem for the first time."""
    cache._warned.clear()
    cache._fallback.clear()
    yield
    cache._warned.clear()
    cache._fallback.clear()


def compile_and_check(f=fn, backend: str = "cpp") -> None:
    """Compile ``f`` afresh and compare two calls with different values with eager."""
    minicompile.reset()
    compiled = minicompile.compile(f, backend=backend)
    for seed in (0, 1):
        torch.manual_seed(seed)
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        torch.testing.assert_close(compiled(x, y), f(x, y))
    assert minicompile.stats()["eager_fallbacks"] == 0


@contextlib.contextmanager
def warnings_with_cache(cache_dir: Path) -> Iterator[list[str]]:
    """Warm entries on, ``cache_dir`` as the cache; yields the minicompile warnings given
    inside (filled in when the block ends)."""
    found: list[str] = []
    with config.patch(cache_dir=cache_dir, warm_entries=True), warnings.catch_warnings(
        record=True
    ) as record:
        warnings.simplefilter("always")
        yield found
    found += [str(w.message) for w in record if "minicompile" in str(w.message)]


def test_cache_dir_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "not-a-dir"
    file.write_text("hello")
    with warnings_with_cache(file) as found:
        compile_and_check(fn)
        compile_and_check(other)
        compile_and_check(fn)  # again: the private directory's entry
    (message,) = found
    assert str(file) in message and "not a directory" in message
    assert file.read_text() == "hello"


def test_cache_dir_that_is_a_file_in_a_new_process(tmp_path: Path) -> None:
    # The example: MINICOMPILE_CACHE_DIR=/etc/hostname crashed at the first call.
    file = tmp_path / "hostname"
    file.write_text("box\n")
    stats, err = run_script(SCRIPT.format(backend="cpp", device="cpu"),
                            {"MINICOMPILE_CACHE_DIR": str(file)}, tmp_path)
    assert err.count("cannot be used") == 1, err
    assert stats["frames"] == 1 and stats["eager_fallbacks"] == 0, stats


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, a read-only directory")
def test_read_only_cache_dir(tmp_path: Path) -> None:
    # /proc refuses new entries even to root (chmod would not stop root).
    read_only = Path("/proc")
    if os.geteuid() != 0:  # an ordinary user: a directory of our own, made read-only
        read_only = tmp_path / "ro"
        read_only.mkdir()
        read_only.chmod(0o500)
    try:
        with warnings_with_cache(read_only) as found:
            compile_and_check(fn)
            compile_and_check(other)
        (message,) = found
        assert str(read_only) in message
    finally:
        if read_only != Path("/proc"):
            read_only.chmod(0o700)


def test_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files made in the cache directory write to /dev/full: ENOSPC, as on a full disk.
    full = tmp_path / "full"
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # noqa: A002 - tempfile's own name
        if dir is not None and Path(dir).is_relative_to(full):
            return os.open("/dev/full", os.O_WRONLY), str(Path(dir) / ".never-written")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(cache.tempfile, "mkstemp", mkstemp)
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"x")
    finally:
        os.close(fd)
    assert e.value.errno == errno.ENOSPC
    with warnings_with_cache(full) as found:
        compile_and_check(fn)
        compile_and_check(other)
    (message,) = found
    assert "No space left" in message


def test_cache_dir_deleted_while_running(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with warnings_with_cache(folder) as found:
        compile_and_check(fn)
        shutil.rmtree(folder)
        compile_and_check(other)  # the directory is made again
        compile_and_check(fn)  # its files are gone: built again
        shutil.rmtree(folder)
        compile_and_check(fn)
    assert len(found) == 1 and "deleted while running" in found[0], found
    assert any(folder.glob("cpp/*/*.so"))


def test_directories_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "cache"
    with config.patch(cache_dir=folder, warm_entries=True):
        compile_and_check(fn)
    made = [tmp_path / "a", folder, *[p for p in folder.rglob("*") if p.is_dir()]]
    assert len(made) > 3
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_two_processes_at_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMPILE_")}
    env.update(PYTHONPATH=str(ROOT), MINICOMPILE_CACHE_DIR=str(tmp_path / "cache"))
    script = SCRIPT.format(backend="cpp", device="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "minicompile:" not in err, err  # no warning
    stats, err = run_script(script, {"MINICOMPILE_CACHE_DIR": str(tmp_path / "cache")},
                            tmp_path)
    assert stats["frames"] == 0, (stats, err)  # a whole entry, read back
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # no half-written file left


def test_a_cache_dir_given_as_text_is_a_folder(tmp_path: Path) -> None:
    """``config.patch(cache_dir="...")`` (and ``dataclasses.replace``) with a str: the same
    folder as with a Path, warm entries included."""
    with warnings_with_cache(str(tmp_path / "text")) as found:  # type: ignore[arg-type]
        assert config.get().cache_dir == tmp_path / "text"
        compile_and_check()
    assert found == []
    assert list((tmp_path / "text").glob("entries/*/*.json"))
    assert list((tmp_path / "text").rglob("mc_*.py"))
