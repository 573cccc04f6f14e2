"""A generated module's compiled code is kept in the cache beside its source: a new process
loads it without compiling (under PYTHONDONTWRITEBYTECODE too), and a code file that does
not match its source, or is damaged, is compiled again, never run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from minicompile.runtime import build


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "mc_test.py"
    path.write_text(f"def call(args):\n    return {body}\n")
    return path


def fresh_import(path: Path):  # noqa: ANN201 (as a new process imports it)
    name = "minicompile_generated.mc_test"
    spec = importlib.util.spec_from_file_location(
        name, path, loader=build.GeneratedLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_code_is_compiled_once_and_loaded_after(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = write(tmp_path, "args[0] + 1")
    assert fresh_import(path).call([1]) == 2
    (code_file,) = tmp_path.glob("mc_test.*.code")
    monkeypatch.setattr(build.GeneratedLoader, "source_to_code",
                        lambda *a: pytest.fail("compiled again"))
    module = fresh_import(path)
    assert module.call([1]) == 2 and module.call.__code__.co_filename == str(path)
    assert not (tmp_path / "__pycache__").exists()


def test_a_changed_source_is_compiled_again(tmp_path: Path) -> None:
    path = write(tmp_path, "args[0] + 1")
    assert fresh_import(path).call([1]) == 2
    write(tmp_path, "args[0] + 2")
    assert fresh_import(path).call([1]) == 3  # (not the code of the old source)


def test_a_damaged_code_file_warns_and_is_compiled_again(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "args[0] * 10")
    fresh_import(path)
    (code_file,) = tmp_path.glob("mc_test.*.code")
    data = code_file.read_bytes()
    code_file.write_bytes(data[:-4] + b"\0\0\0\0")
    with pytest.warns(RuntimeWarning, match="is corrupted"):
        assert fresh_import(path).call([3]) == 30
    monkeypatch.setattr(build.GeneratedLoader, "source_to_code",
                        lambda *a: pytest.fail("compiled again"))
    assert fresh_import(path).call([4]) == 40  # (rewritten whole)
