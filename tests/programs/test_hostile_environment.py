"""A hostile environment degrades, never crashes: with no C++ compiler, one that fails,
Triton missing or Triton failing to import, a program gives one clear warning and runs on
(the C++ backend instead of Triton on CPU tensors, or eagerly), with eager's values.

Each condition is made for a fresh Python process (the tools are probed once per process),
which compiles two functions and calls each twice with different values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""\
    import json, sys, warnings
    if sys.argv[1] == "missing":
        sys.modules["triton"] = None  # as if it were not installed
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import torch
        import minicompile

        def f(x):
            return torch.sin(x) * 2 + 1

        def g(x, y):
            return (x * y).sum(0) - y

        for backend in sys.argv[2].split(","):
            for fn, arity in ((f, 1), (g, 2)):
                compiled = minicompile.compile(fn, backend=backend)
                for seed in (0, 1):
                    gen = torch.Generator().manual_seed(seed)
                    args = [torch.randn(3, 4, generator=gen) for _ in range(arity)]
                    torch.testing.assert_close(compiled(*args), fn(*args))
    ours = [str(w.message) for w in caught if str(w.message).startswith("minicompile")]
    print(json.dumps({"warnings": ours, "stats": minicompile.stats()}))
    """)


def run(tmp_path: Path, condition: str, backends: str, **env: str) -> dict:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    environ = {**os.environ, "MINICOMPILE_CACHE_DIR": str(tmp_path / "cache"),
               "TRITON_INTERPRET": "1", **env}
    environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    proc = subprocess.run([sys.executable, str(script), condition, backends], env=environ,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cxx, problem", [
    ("/nonexistent/g++", "it cannot run"),
    ("false", "it fails on a trivial program"),
])
def test_a_missing_or_failing_cxx_warns_once_and_runs_eagerly(tmp_path: Path, cxx: str,
                                                               problem: str) -> None:
    out = run(tmp_path, "-", "cpp", CXX=cxx)
    assert len(out["warnings"]) == 1, out["warnings"]
    assert f"the C++ compiler {cxx!r} does not work ({problem}" in out["warnings"][0]
    assert out["stats"]["eager_fallbacks"] == 2 and out["stats"]["graphs"] == 0


def test_missing_triton_warns_once_and_compiles_with_cpp(tmp_path: Path) -> None:
    out = run(tmp_path, "missing", "triton,cpp")
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "Triton is not available (ModuleNotFoundError" in out["warnings"][0]
    assert out["stats"]["graphs"] == 4 and out["stats"]["eager_fallbacks"] == 0


def test_triton_failing_to_import_warns_once_and_compiles_with_cpp(tmp_path: Path) -> None:
    broken = tmp_path / "site" / "triton"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("libcuda.so.1: cannot open")\n')
    out = run(tmp_path, "-", "triton,cpp", PYTHONPATH=str(tmp_path / "site"))
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "Triton is not available (RuntimeError: libcuda.so.1" in out["warnings"][0]
    assert out["stats"]["graphs"] == 4 and out["stats"]["eager_fallbacks"] == 0


def _broken_triton(tmp_path: Path) -> str:
    broken = tmp_path / "site" / "triton"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("libcuda.so.1: cannot open")\n')
    return str(tmp_path / "site")


def _python(tmp_path: Path, code: str, site: str | None) -> list[str]:
    environ = {**os.environ, "MINICOMPILE_CACHE_DIR": str(tmp_path / "cache")}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, str(ROOT)) if p)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


def test_a_triton_failing_to_import_raises_import_error_for_everyone_after_a_compile(
        tmp_path: Path) -> None:
    """minicompile does not import Triton to probe it; after its first compile, whoever
    imports a broken Triton (PyTorch's Dynamo expects only ImportError) gets ImportError."""
    out = _python(tmp_path, """\
        import importlib.util, sys, torch, minicompile
        f = minicompile.compile(lambda x: x.sin() + 1, backend="cpp")
        for x in (torch.randn(5), torch.randn(5)):  # fresh values each call
            torch.testing.assert_close(f(x), x.sin() + 1)
        print("triton" in sys.modules)
        for attempt in (1, 2):
            try:
                import triton
            except ImportError as e:
                print(type(e).__name__, e)
        print(importlib.util.find_spec("triton").origin)
        """, _broken_triton(tmp_path))
    assert out[0] == "False"  # a C++ graph never imported it
    assert out[1] == out[2] == ("ImportError Triton failed to import "
                                "(RuntimeError: libcuda.so.1: cannot open)")
    assert out[3] == "None"  # no file of it: cache keys say "no Triton"


@pytest.mark.parametrize("broken", [False, True])
def test_build_workers_say_whether_triton_imports(tmp_path: Path, broken: bool) -> None:
    """The GPU path asks the first build worker whether Triton imports, so the launching
    process does not import it; a broken one is reported with the worker's reason."""
    out = _python(tmp_path, """\
        import sys
        from minicompile.runtime import triton_build
        triton_build.start_workers(1)
        print(triton_build.import_problem())
        print("triton" in sys.modules)
        triton_build.stop_workers()
        """, _broken_triton(tmp_path) if broken else None)
    if broken:
        assert out == ["RuntimeError: libcuda.so.1: cannot open", "False"]
    else:
        assert out == ["None", "False"]
